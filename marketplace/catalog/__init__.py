"""The catalogue: GPU spec table, offer ingestion (validate, normalise, upsert, quarantine) and reads."""
