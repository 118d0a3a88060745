"""The hosts: hosts.yaml's model, the validated inventory cached for a cold exec, and the host names
both resolve."""
