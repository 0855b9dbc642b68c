"""Datasets: encrypted upload within quota, visibility, the catalog, use by jobs."""
