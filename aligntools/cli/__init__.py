"""``mlab`` subcommands of aligntools: ``capture``, ``check``, ``diff`` (each module has ``register``)."""
