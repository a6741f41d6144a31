"""The front end every front door shares (the HTTP server, the pipeline, `dashinfer chat`,
EngineHelper): the input side (prompts.py), the output side (outputs.py), the tool-call and
reasoning parsers (parsers/), and the one place an engine is picked and started (engines.py)."""
from .engines import EngineStartError, new_engine, start_engine
from .outputs import Delta, OutputProcessor
from .parsers import ToolCall
from .prompts import PromptError, Prompts

__all__ = ["Delta", "EngineStartError", "OutputProcessor", "PromptError", "Prompts", "ToolCall", "new_engine",
           "start_engine"]
