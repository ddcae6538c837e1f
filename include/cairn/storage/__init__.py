"""Where bytes live (fsspec `Storage`, S3 access) and how every key is named (`layout`)."""
