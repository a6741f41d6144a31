"""Chat prompt formatting, as DashInfer's PromptTemplate."""

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


class PromptTemplate:

    @staticmethod
    def apply_chatml_template(text, system_prompt: str = DEFAULT_SYSTEM_PROMPT):
        """One user turn in ChatML (Qwen's format), ending where the assistant's answer begins.
        text: a string, or a list of strings for a list of prompts.

        The text is DashInfer's to the character, so the same example gives the same prompt ids:
        its template ends "<|im_start|>assistant " with a space and no newline (its jinja source
        has " \n" there, and jinja drops a template's final newline)."""
        if isinstance(text, (list, tuple)):
            return [PromptTemplate.apply_chatml_template(t, system_prompt) for t in text]
        if not isinstance(text, str):
            raise TypeError(f"apply_chatml_template: text must be a str or a list of str, "
                            f"got {type(text).__name__}")
        return (f"<|im_start|>system\n{system_prompt}<|im_end|>\n"
                f"<|im_start|>user\n{text}<|im_end|>\n"
                f"<|im_start|>assistant ")

    @staticmethod
    def apply_chat_template(tokenizer, text, system_prompt: str = None):
        """One user turn formatted by the tokenizer's own chat template (SmolLM2, LLaMA 3, ...), with
        the assistant's turn opened. system_prompt None leaves the system turn to the template (some
        templates add a default one). text: a string or a list of strings."""
        if isinstance(text, (list, tuple)):
            return [PromptTemplate.apply_chat_template(tokenizer, t, system_prompt) for t in text]
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("apply_chat_template: this tokenizer has no chat template; "
                             "use apply_chatml_template or format the prompt yourself")
        messages = [{"role": "user", "content": text}]
        if system_prompt is not None:
            messages.insert(0, {"role": "system", "content": system_prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
