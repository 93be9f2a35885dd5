"""Catalog definitions shipped with lakeckpt-tables: default embedded catalog and SQL views."""
