"""The elastic-ctr component package's provider plugin (``provider.host``).

Pulumi runs it as ``python <this directory> <engine address>`` when a program in any
language uses the package (``PulumiPlugin.yaml``; ``pulumi package add`` generates that
program's SDK from the schema it serves). Not part of the Python program (``infra/``).
"""
from provider.host import main

if __name__ == "__main__":
    main()
