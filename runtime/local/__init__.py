"""The local pipeline (``elastic-ctr local``, what ``make demo`` runs): every role as a
process on 127.0.0.1, started with the same subcommands the pods run."""
