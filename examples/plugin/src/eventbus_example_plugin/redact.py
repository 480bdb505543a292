"""The ``redact`` step: replace the values of some data fields by a mask.

```yaml
    - id: hide_card
      redact: {fields: [card, cvv], mask: "***"}
```
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from eventbus import CloudEvent
from eventbus.pipelines import Step, StepContext, StepResult
from eventbus.registry import steps


class RedactConfig(BaseModel):
    """Which top-level data fields to mask, and with what."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    fields: list[str] = Field(min_length=1, description="Data fields whose values are masked.")
    mask: str = Field(default="***", description="What replaces each value.")


class RedactStep(Step):
    """Masks fields of each event's data; events whose data is not an object pass unchanged."""

    kind = "redact"
    pure = True  # no I/O: small batches may run on the replica's event loop

    def __init__(self, step_id: str, config: RedactConfig) -> None:
        super().__init__(step_id)
        self.fields = tuple(config.fields)
        self.mask = config.mask

    def process(self, events: list[CloudEvent]) -> list[StepResult]:
        out: list[StepResult] = []
        for e in events:
            data = e.data
            if isinstance(data, dict) and any(f in data for f in self.fields):
                data = {k: (self.mask if k in self.fields else v) for k, v in data.items()}
                out.append(e.replace(data=data))
            else:
                out.append(e)
        return out


@steps.register(
    "redact",
    config=RedactConfig,
    description="Mask data fields.",
    pure=True,
    example={"fields": ["card"]},  # what the behaviour suites build and run
)
def build(step_id: str, config: RedactConfig, context: StepContext) -> RedactStep:
    """A redact step."""
    return RedactStep(step_id, config)
