"""What users bring that speaks the OpenAI API: the endpoint agent episodes talk to (each its
own base URL and key, in front of a rollout replica) and the token-exact capture of what they
train on."""
