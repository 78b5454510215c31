"""Streamlit dashboards over the lineage store (read-only): ``openforge dashboard``; one module per page in views/."""
