"""Small helpers with no torch: package names imported on first use, one message for an
unknown keyword, optional packages imported on use, and where the package keeps its files
and reads its data sets."""
