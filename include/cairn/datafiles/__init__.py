"""Output data files: one module per file format behind one seam.

As Kafka Connect's `Format` and `RecordWriterProvider` do, a format here is what a file is
called (its extension, which `cairn.storage.layout` puts in every name) and a writer that
streams records into one object through `Storage.open_write` with memory bounded by one block or
row group, and counts what it wrote in a `FileStats` (records, offsets, event times): every
file Cairn writes is accounted for the same way, whatever its format.

- `avro_file`: the archive's files (backup, partitioned, quarantine) and sealed files, written
  record by record or datum by datum (`AvroFileWriter`), or merged block by block from files of
  one schema without decoding them (`BlockFileWriter`).
- `parquet_file`: the Iceberg table's files, written from Arrow batches (`ParquetFileWriter`).
- `writer`: the archive's one-pass writer, routing each Kafka record to its files.
"""
