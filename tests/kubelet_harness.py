"""The kubelet stand-in lives in the package (the demo uses it too); tests import it from here."""

from dra_driver.plugin.grpc.kubelet import KubeletHarness, PluginInfo, RegistrationError

__all__ = ["KubeletHarness", "PluginInfo", "RegistrationError"]
