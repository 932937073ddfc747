"""Framework-free core of horovodlike: start-up, the engine binding and collectives on numpy."""
