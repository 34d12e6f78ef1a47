"""What a study is and which trial runs next: the stored ``StudySpec``, opening and counting a
study, claiming (cell, seed) trials, adaptive seed decisions, the labels a trial carries, and
reading a study back as ``StudyData``."""
