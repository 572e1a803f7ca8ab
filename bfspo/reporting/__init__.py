"""Tables, figures, W&B report runs, and the text views of logged search trees."""
