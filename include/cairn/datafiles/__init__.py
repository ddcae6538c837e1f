"""Output data files: Avro files and the one-pass writer."""
