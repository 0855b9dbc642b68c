"""Data-access requests and the grants they become once approved."""
