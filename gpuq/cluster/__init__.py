"""The lab's other servers, reached over ssh: the command line to them, and the check of one."""
