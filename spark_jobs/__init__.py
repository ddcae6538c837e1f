"""Cairn's Spark jobs: each module only adapts Spark to the core (`cairn`); `main` is their one
entry point. The package ships to the cluster with `cairn` in the code artifact."""
