"""An example EventBus plugin: the ``redact`` step and the ``jsonl`` sink."""
