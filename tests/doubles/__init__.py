"""Rigs for our own tests and benchmarks that no shipped module may import (an import-linter contract says so):
a real S3-compatible server (``seaweedfs``: SeaweedFS's ``weed mini``) and a Kubernetes API server emulator with a
fake kubelet (``k8s_emulator``). They stand in for what cannot run here; the code under test is the real thing."""
