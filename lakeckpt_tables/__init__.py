"""lakeckpt-tables: train PyTorch from Delta and Iceberg tables and resume exactly."""
