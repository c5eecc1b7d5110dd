"""The Pulumi program: the stack configuration (one typed model), the program that declares the
components from it, the offline rendering and the preview diff."""
