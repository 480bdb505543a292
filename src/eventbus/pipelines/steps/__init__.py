"""The built-in step kinds, one module each (registered in :data:`eventbus.registry.steps`):
``filter``, ``convert``, ``function``, ``join``, ``allocate``, ``model`` and ``ensemble``."""
