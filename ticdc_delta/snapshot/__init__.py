"""Bootstrap: load a consistent TiDB snapshot (a Dumpling export) into the Delta tables, then stream from
its TSO. :mod:`.dumpling` reads the export (plain Python); :mod:`.load` loads it with Spark."""
