"""Qualifying a vLLM release: the matrix on the release before and the new one (or stored runs of them), what
changed cell by cell, where each change happened among the releases in between, every finding's script run on the
new one, and the waivers the change frees or must bound; one report and an exit status for CI."""
