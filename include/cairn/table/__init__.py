"""The topic's Apache Iceberg table: its catalog."""
