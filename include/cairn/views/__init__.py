"""Operator views: status, overview, finding records, audits, metrics, alerts, replay."""
