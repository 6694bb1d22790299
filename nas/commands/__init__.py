"""One module per ``nas`` subcommand; see :mod:`nas.cli` for the contract."""
