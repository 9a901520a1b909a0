"""`make bench`: the standard serving shapes, through the console and against vLLM reached directly, with GuideLLM
where it can express a shape and bench/standard/driver.py where it cannot. Run it as `python bench/standard`."""
