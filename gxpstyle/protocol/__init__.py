"""The wire: frames, messages and their schemas, the serializer."""
