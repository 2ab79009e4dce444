"""Validating admission webhook: our opaque device configuration in ResourceClaims and ResourceClaimTemplates is
checked when they are created, with the error prepare would give on the node after scheduling."""
