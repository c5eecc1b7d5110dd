"""The file server role (``elastic-ctr fileserver``): the version root over HTTP, with
token-authenticated uploads. ``app`` is the WSGI application, ``cli`` its subcommand."""
