"""The steps of each DAG: planning and archiving runs, rebuilds, completeness."""
