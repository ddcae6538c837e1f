"""Output data files: the archive's Avro files, the table's Parquet files, and the writer.

Avro is the archive's one file format by design, not one choice behind a seam: a file's name
(`.avro` in `cairn.storage.layout`) is derived from the coordinates of the records it holds,
sealing merges Avro blocks without decoding them, the JVM encodes Avro datums (`fastpath`), and
rewinds, rebuilds and proofs read offsets and sources from Avro headers. A second archive format
would change all of those, so no interface pretends it would not; every file, whatever its
format, is counted alike (`avro_file.FileStats`) and recorded alike (`file_entry.FileEntry`).

- `avro_file`: the archive's files (backup, partitioned, quarantine) and sealed files, written
  record by record or datum by datum (`AvroFileWriter`), or merged block by block from files of
  one schema without decoding them (`BlockFileWriter`).
- `fastpath`: the JVM side of the writer, the Spark SQL that encodes backup datums and parses
  JSON values.
- `writer`: the archive's one-pass writer, routing each Kafka record to its files.
- `sealed_file`: a sealed file, the backup offsets its header lists, and their tally for a proof.
- `seal_writer`: the seal's writer, one folder's files merged into sealed files and table files.
- `parquet_file`: the Iceberg table's files, written from Arrow batches (`ParquetFileWriter`).
- `file_entry`: what a manifest records of each file.
"""
