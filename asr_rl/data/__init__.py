"""Data: manifests, audio loading, batching, prompt sets and the demo corpus synthesiser."""
from asr_rl.data.audio import AudioError, audio_info, load_audio
from asr_rl.data.batching import AudioBatch, BatchLoader, iter_batches, load_batch
from asr_rl.data.manifest import ManifestError, Utterance, read_manifest, scan_manifest

__all__ = ["AudioError", "audio_info", "load_audio", "AudioBatch", "BatchLoader", "iter_batches", "load_batch",
           "ManifestError", "Utterance", "read_manifest", "scan_manifest"]
