"""Fuzz targets of the decoders that read outside input, and their atheris runner."""
