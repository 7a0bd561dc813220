"""specchat's Textual UI. Never imports torch: the engine session is built inside a worker thread."""
