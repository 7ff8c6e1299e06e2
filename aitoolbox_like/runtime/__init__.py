"""What the loop runs on, one room below the engine: devices, mixed precision (:mod:`.amp`), copies to the host
without a sync (:mod:`.host_copy`), batches moved ahead of the step (:mod:`.prefetch`), the console's progress line
(:mod:`.console`), and the typing and torchvision shims every room may use."""
