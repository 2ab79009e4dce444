"""What the kubelet plugin (dra_driver.plugin) and GPU sharing (dra_driver.sharing) both know about a claim: the
record of what was prepared for it (checkpoint), the named steps a test can crash at (crashpoints), the deadline of
the call working on it (deadline), and the opaque configuration it asks for (config).

A layer below both: the plugin drives a claim through prepare and unprepare, sharing applies its settings and
records them in the same checkpoint entry, so each needs these and neither may import the other's package. The
opaque configuration lives here, not in an API package of its own, because it is read only as part of a claim
(the webhook validates it in claims, the plugin resolves it per device, sharing applies it); it takes a claim's
allocated config entries by their shape, so that it needs nothing of the plugin's ResourceClaim models.
Nothing here imports the plugin, sharing, or anything above them.
"""
