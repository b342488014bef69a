"""Provider adapters over httpx."""
