"""The commit protocol: claims, tokens, requirements, publication, rewinds, attempt manifests."""
