"""The long runs: agent evaluation, the seed orchestrator, task synthesis; their journal and model server."""
