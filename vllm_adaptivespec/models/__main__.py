"""`python -m vllm_adaptivespec.models prepare|list|path ...` (same as `adaptivespec models ...`)."""

from ..cli_models import main

raise SystemExit(main())
