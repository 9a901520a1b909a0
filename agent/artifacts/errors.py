class ArtifactError(ValueError):
    """An artifact that cannot be used; the message names the file and what is wrong."""
