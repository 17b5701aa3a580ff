"""The INRI client SDK: devices (register, listen, pull, ack, decrypt) and home apps (push).

    device = DeviceClient("http://relay.example:8480", state_path="device.json")   # or 2-3 home URLs
    await device.register()
    credential = device.export_credential(20)      # hand this to your home app
    app = HomeAppClient(["http://any-relay.example:8480"])
    await app.push(credential, b"new mail")
    async with device.stream() as messages:
        async for message in messages: ...
"""

from inri.client.app import HomeAppClient, PushReceipt
from inri.client.credential import DeviceKeys, PushCredential, open_sealed, seal
from inri.client.device import MAX_HOMES, DeviceClient, Home, Message, WakeHook, WebPushEndpoint, stream_many
from inri.client.errors import ApiError, NoTokensLeft
from inri.protocol.wake import WakeProvider, seal_wake_token

__all__ = ["MAX_HOMES", "ApiError", "DeviceClient", "DeviceKeys", "Home", "HomeAppClient", "Message", "NoTokensLeft",
           "PushCredential", "PushReceipt", "WakeHook", "WakeProvider", "WebPushEndpoint", "open_sealed", "seal",
           "seal_wake_token", "stream_many"]
