"""Turn a study (or its DataFrame) into tables, figures and one HTML page."""
