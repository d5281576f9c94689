"""The warm image: the image plus one layer holding what its first boot compiled, so that a first boot is a warm boot.

  capture.py     `builder warm` as one call, run(Request) -> Warmed | Captured: a cold boot at an empty cache root
                 (through smoke's L3), the capture, the pack, a warm boot from the layer, the push beside the cold
                 image (images.json's warm table written by image/publish.py); or, by a process on a GPU host
                 without Docker, the capture and a warm boot in place
  layer.py       the capture directory (tree/, warm.json) and the pack: a Dockerfile FROM the cold image by digest,
                 built by BuildKit, loaded under the warm tag
  restore.py     a warm layer's files put at a GPU host's cache root, with their times

It stands on runtime/ and smoke/; of builder/image/ it takes the contract, the OCI archive and the publication
(tests/unit/project/test_layers.py). runtime/ never imports it. The verb is builder/cli/warm.py.
"""
