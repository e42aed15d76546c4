"""Running tidings' own processes: ``--processes N`` supervision and the embedded Redis."""
