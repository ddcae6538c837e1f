"""Kafka: one connection configuration for every client, and what the cluster says."""
