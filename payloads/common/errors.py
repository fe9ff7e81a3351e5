class ConfigError(ValueError):
    """Bad input (command line, data, checkpoint): the message names the problem and the fix."""
