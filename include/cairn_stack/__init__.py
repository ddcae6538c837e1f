"""The local stack: real Kafka (KRaft), SeaweedFS (S3) and Airflow 3 on loopback, for the demo and
the tests. Development tooling, not part of the archiver's rules (those live in `cairn`)."""
