"""Pictures and videos: loading, decoding in a worker, boxes drawn on pictures."""
