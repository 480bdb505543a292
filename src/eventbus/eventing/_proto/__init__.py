"""Generated protobuf and gRPC modules (``make proto`` regenerates them; do not edit).

``cloudevents.proto`` is the CloudEvents protobuf format (Apache-2.0, see
``LICENSE.Apache-2.0``); ``eventbus.proto`` the gateway's service.
"""
