"""The I/O the shells share: the bundled model catalog, config.json files and ConfigMaps, the hub fetch."""
