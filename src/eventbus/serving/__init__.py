"""Ray Serve applications per pipeline, source actors, the controller and the local stack.

Importing this package imports Ray; ``import eventbus`` alone does not.
"""

from __future__ import annotations

from eventbus._internal.stack import Stack, load_stack, stack_down, stack_status, stack_up
from eventbus.serving._controller import Controller
from eventbus.serving._controller_client import EventBusClient
from eventbus.serving._deployment import PipelineDeployment, app_name, build_app

__all__ = [
    "Controller",
    "EventBusClient",
    "PipelineDeployment",
    "Stack",
    "app_name",
    "build_app",
    "load_stack",
    "stack_down",
    "stack_status",
    "stack_up",
]
